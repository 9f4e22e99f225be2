"""The placeholder backend (PLACEHOLDER_MODEL): an echo of the prompt's words through the real engine
loop, so the service runs and is tested without weights (engine.py)."""
