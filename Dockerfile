FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY domain ./domain
COPY projections ./projections
COPY adapters ./adapters
RUN pip install --no-cache-dir .
ENTRYPOINT []
CMD ["baton", "--help"]
