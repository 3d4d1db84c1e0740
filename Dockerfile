FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY azqueue ./azqueue
RUN pip install --no-cache-dir .
EXPOSE 8080
ENV AZQUEUE_HOST=0.0.0.0
CMD ["azqueue", "serve"]
