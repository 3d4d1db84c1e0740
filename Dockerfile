FROM python:3.11-slim
# The server runs as a user of its own, not root; it writes nothing but its logs (stdout).
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin azqueue
WORKDIR /app
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY azurite/package.json azurite/package-lock.json ./azurite/
COPY deploy/constraints.txt ./
COPY azqueue ./azqueue
# The commit and build this image is made from, served by GET /__version__ (Dockerflow):
#   docker build --build-arg COMMIT=$(git rev-parse HEAD) --build-arg BUILD=<CI run URL> .
ARG COMMIT=""
ARG BUILD=""
RUN python -c 'import json, sys; json.dump({"commit": sys.argv[1], "build": sys.argv[2]}, open("azqueue/version.json", "w"))' "$COMMIT" "$BUILD"
# Exactly the versions the release was tested with (scripts/image_constraints.py).
RUN pip install --no-cache-dir -c constraints.txt .
USER azqueue
EXPOSE 8080
ENV AZQUEUE_HOST=0.0.0.0
CMD ["azqueue", "serve"]
