"""tools/llmc_format.py — llm.c's GPT-2 model-file layout, shared by the Python tools
(oracle.py, make_test_model.py, pytorch_train_d12.py) so it is written once."""

MODEL_MAGIC = 20240326


def param_shapes(maxT, L, C, Vp):
    """llm.c's parameter order and shapes (linear weights are [out, in])."""
    return [
        ("wte", (Vp, C)), ("wpe", (maxT, C)),
        ("ln1w", (L, C)), ("ln1b", (L, C)),
        ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
        ("attprojw", (L, C, C)), ("attprojb", (L, C)),
        ("ln2w", (L, C)), ("ln2b", (L, C)),
        ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
        ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
        ("lnfw", (C,)), ("lnfb", (C,)),
    ]
