"""The vectorized truth of the stateless KV mode (properties/kv_truth.py) equals the
numpy reference of docs/contract.md §9 (blocktable.reference.kv) on many small random
calls of every op, layout, dtype and storage form: whole buffers, bit for bit."""

import numpy as np
import pytest

from blocktable.properties.kv import truth as kv_truth
from blocktable.properties.kv.call import build
from blocktable.properties.kv.draw import draw
from blocktable.reference import kv as reference


def applied(call, model):
    """Every flat buffer of the call after `model`'s op ran through the host views."""
    regions, _, _, _ = build(call)
    flats = {r.name: r.flat.copy() for r in regions}
    by_name = {r.name: r for r in regions}

    def get(region, view):
        return by_name[region].host(flats[region], view)

    options = {k: call[k] for k in ("layout", "kv_cache_dtype", "k_scale", "v_scale")}
    cache = [r.name for r in regions if "key_cache" in r.views][0]
    value_cache = [r.name for r in regions if "value_cache" in r.views][0]
    if call["op"] == "write":
        key = [r.name for r in regions if "key" in r.views][0]
        value = [r.name for r in regions if "value" in r.views][0]
        model.write(get(key, "key"), get(value, "value"), get(cache, "key_cache"), get(value_cache, "value_cache"),
                    get("slot_mapping", "slot_mapping"), **options)
    elif call["op"] == "copy":
        layers = range(call["layers"])
        names = {(layer, v): next(r.name for r in regions if r.name.startswith(f"layer {layer} ") and v in r.views)
                 for layer in layers for v in ("key_cache", "value_cache")}
        model.copy_blocks([get(names[layer, "key_cache"], "key_cache") for layer in layers],
                          [get(names[layer, "value_cache"], "value_cache") for layer in layers],
                          get("block_mapping", "block_mapping"))
    else:
        model.gather(get(cache, "key_cache"), get(value_cache, "value_cache"), get("block_table", "block_table"),
                     get("cu_lens", "cu_lens"), get("out_key", "out_key"), get("out_value", "out_value"), **options)
    return flats


@pytest.mark.parametrize("op", ["write", "copy", "gather"])
def test_the_vectorized_truth_is_the_reference(op):
    rng = np.random.default_rng(7)
    changed = 0
    for _ in range(150):
        call = draw(op, rng, max_elements=1500, max_tokens=24)
        before = {r.name: r.flat for r in build(call)[0]}
        fast, slow = applied(call, kv_truth), applied(call, reference)
        assert fast.keys() == slow.keys()
        for name in fast:
            assert fast[name].tobytes() == slow[name].tobytes(), (name, call)
            changed += fast[name].tobytes() != before[name].tobytes()
    assert changed > 50  # the calls do write: equal because both wrote the same, not because neither did
