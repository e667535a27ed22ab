"""A params tree for a test, read as the stages read params (stages/lib/params.py): by key,
`params["train"]["steps"]`, or by attribute, `params.train.steps`; also a partial one (only
the sections the code under test reads), which the typed Params cannot be."""


class Sections(dict):
    def __init__(self, data: dict):
        super().__init__({k: Sections(v) if isinstance(v, dict) else v for k, v in data.items()})

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None
