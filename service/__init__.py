"""The control plane: the FastAPI app, the study store, study submission to Ray, the `ptctl` CLI.

May import `analysis`, `studies` and `workers`; no package imports it, and FastAPI is imported nowhere else.
"""
