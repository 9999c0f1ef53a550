"""The built-in model families, one module each: its arch, its model config, its search space, its counts and its
`studies.family.register` call. Importing this package registers them, in the order imported below (the order
every list of families shows; installed plugins' families follow, `studies.family.load_plugins`). A new built-in
family is a module here, a line below and its model under `workers/models/`.
"""

# the registration order, not sorted:
# isort: off
from studies.families import pt
from studies.families import bert
from studies.families import ut
from studies.families import tauformer
from studies.families import hf
# isort: on

__all__ = ["bert", "hf", "pt", "tauformer", "ut"]
