# Lucid: one image for the bot, the workers and the cron process (the command picks the role).
# Build stage compiles wheels; the final stage has no build tools and runs as an unprivileged user.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY memory_core ./memory_core
COPY workers ./workers
COPY bot ./bot
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 lucid \
    && mkdir -p /data && chown lucid:lucid /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER lucid
ENV LUCID_DATA=/data LUCID_PORT=8080 PYTHONUNBUFFERED=1
VOLUME ["/data"]
EXPOSE 8080
ENTRYPOINT ["lucid"]
CMD ["bot"]
