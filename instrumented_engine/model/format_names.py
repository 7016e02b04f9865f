"""The names `--dtype` and `--weight-format` accept, without torch: the CLI's parser reads them
before anything imports torch (`cpu_formats.py` gives them their meaning)."""

# "auto" = the plan measured for the CPU's capability; a dense format alone forces it for every
# step (no weight-only kernel): oneDNN's prepacked bf16 or fp32 GEMM, or F.linear ("dense").
WEIGHT_FORMAT_CHOICES = ("auto", "bf16", "fp32", "dense")
DTYPE_CHOICES = ("auto", "bf16", "bfloat16", "fp32", "float32", "fp16", "float16")
