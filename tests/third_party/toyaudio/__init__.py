"""A third-party audio model for Funnel: WAV files in, a loudness level per 10 ms frame out."""
