"""The benchmark's only app: a no-op handler for the queue ``bench``."""
