"""An app whose models module imports its tasks: the Tasks backend is built while Django sets up."""
