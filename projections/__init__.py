"""Pure folds over recorded events (portable state, budgets, replay prefix): see issue 3."""
