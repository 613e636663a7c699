"""Seeing what Funnel does: log lines with request ids (logs) and OpenTelemetry traces (tracing)."""
