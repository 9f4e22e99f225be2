"""genq's settings by theme: one module per section of the one Settings class (shared/config.py),
each declaring its fields (with a docstring each, which the README's table is generated from)
and the validators that read only its own fields. Cross-field rules live in shared/config.py."""
