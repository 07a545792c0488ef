# gantry in a container: `gantry start` (server and worker in one process, embedded
# SQLite) by default; `docker run … gantry server` or `gantry worker …` for the others.
#
#   docker build -t gantry .
#   docker run -p 8080:8080 -v gantry:/var/lib/gantry gantry
#   docker run --gpus all -p 8080:8080 -v gantry:/var/lib/gantry gantry   # NVIDIA GPUs
#
# Three stages: the Rust build, llama.cpp's llama-server built by gantry's own installer
# (the recipe the worker uses on demand; about ten minutes on two cores, CPU build), and a
# small runtime image that runs as an unprivileged user. `--build-arg LLAMA_SERVER=no`
# leaves llama-server out (a worker then installs it on demand, which needs cmake and a
# compiler in the image — use it with an external llama-server or vLLM instead).
# With --gpus, NVML comes from the NVIDIA container runtime; this image holds a CPU build
# of llama-server, so GPU models need a CUDA build or vLLM mounted in.

ARG DEBIAN=bookworm

FROM rust:1-${DEBIAN} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p gantry -p gantry-install --bins \
    && mkdir -p /out \
    && cp target/dist/gantry target/dist/gantry-install /out/

FROM build AS llama
ARG LLAMA_SERVER=yes
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# gantry-install prints the built binary's path as its last line.
RUN mkdir -p /out/llama \
    && if [ "$LLAMA_SERVER" = yes ]; then \
         apt-get update && apt-get install -y --no-install-recommends cmake \
         && built=$(GANTRY_CACHE_DIR=/tmp/gantry-cache /out/gantry-install llama-server --cpu | tail -n 1) \
         && cp "$built" /out/llama/llama-server; \
       fi

FROM debian:${DEBIAN}-slim
# ca-certificates: HTTPS to Hugging Face, S3 and PyPI; libgomp1: llama-server's OpenMP.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/gantry --create-home gantry
COPY --from=build /out/gantry /usr/local/bin/gantry
COPY --from=llama /out/llama/ /usr/local/bin/
USER gantry
WORKDIR /var/lib/gantry
# Every key can be set as GANTRY_<KEY> (see the README's configuration table).
ENV GANTRY_DATA_DIR=/var/lib/gantry \
    GANTRY_HOST=0.0.0.0 \
    GANTRY_PORT=8080 \
    GANTRY_CACHE_DIR=/var/lib/gantry/cache
VOLUME ["/var/lib/gantry"]
EXPOSE 8080
STOPSIGNAL SIGTERM
ENTRYPOINT ["gantry"]
CMD ["start"]
