"""A compact, instrumented PyTorch inference engine for Llama-family models."""
