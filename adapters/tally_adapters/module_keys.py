"""A logical param's dotted name ("decoder.layers.0.mlp.linear_fc1.weight") as the key of a torch
module's parameter or submodule, which may hold no dot, and back: each worker registers tally's
params under these keys and finds them again by them."""


def module_key(name: str) -> str:
    return name.replace(".", "__")


def name_of_module_key(key: str) -> str:
    return key.replace("__", ".")
