"""`python -m tracer compare A.json B.json`: two replay results, before and after."""
