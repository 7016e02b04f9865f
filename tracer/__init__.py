"""ttftscope tracer: stage timelines, attribution, spans, metrics and logs. Never imports torch."""
