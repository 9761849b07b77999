"""Stand-in of python/sglang/srt/layers/dp_attention.py as
managers/cache_controller.py @001067ff imports it: is_dp_attention_enabled,
get_attention_dp_rank, get_attention_dp_size. Attention DP is off here."""


def is_dp_attention_enabled():
    return False


def get_attention_dp_rank():
    return 0


def get_attention_dp_size():
    return 1
