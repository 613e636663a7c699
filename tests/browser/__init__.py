"""The page at GET / in a real headless Chromium."""
