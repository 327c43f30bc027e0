"""Flags of the headless Chromium that the admin's browser tests and ``scripts/admin_screenshots.py`` drive.

No GPU, no sandbox (the CI machine runs as root), and nothing that would reach
the network on its own (background updates, sync, QUIC): the pages are on loopback.
"""

HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
