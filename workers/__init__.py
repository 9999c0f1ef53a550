"""HOW one trial runs: the models (`models/`), μP, the data, the training loop, the Ray Tune glue, MLflow tracking.

Imports `analysis` and `studies`, never `service` or fastapi; Ray is imported in one package (`ray/`),
MLflow in one (`mlflow_tracker`).
"""

import studies  # noqa: F401  the families, plugins included, register before any workers module a plugin imports
