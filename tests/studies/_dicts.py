import copy


def with_changes(base: dict, **changes: object) -> dict:
    """A deep copy of `base` with dotted-path changes, e.g. with_changes(d, **{"verify.delta": 0.3})."""
    data = copy.deepcopy(base)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data
