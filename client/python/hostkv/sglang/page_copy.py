"""Whole pages between two SGLang-shaped host kv_buffers of one layout.

SGLang's host kv_buffer keeps its pages along one axis: token rows
(layer_first, page_first: a page is page_size consecutive rows) or page
blocks (page_first_direct, page_head: one index per page). Two buffers of
the same geometry and layout, of any sizes (the engine's host pool and a
hostkvd pool's mapping), then exchange pages run by run with copy_ between
views on that axis, as raw bytes (fp8 kept as uint8 and as float8 alike). Shapes: hostkv.pool_mapping.sglang_shape.
"""
from .. import errors


def _torch():
    import torch  # pylint: disable=import-outside-toplevel
    return torch


def page_axis(layout, mha):
    """(axis, per_token) of the pages in a kv_buffer of `layout`: per_token
    when the axis holds token rows, else one index per page."""
    first = 1 if mha else 0  # MHA buffers lead with the K/V axis
    if layout == "layer_first":
        return first + 1, True
    if layout == "page_first":
        return first, True
    if layout == "page_first_direct" or (layout == "page_head" and mha):
        return first, False
    raise ValueError(f"Unsupported layout: {layout}")


def _raw(buf):
    torch = _torch()
    return buf if buf.dtype == torch.uint8 else buf.view(torch.uint8)


def check_same_pages(a, b, layout, mha):
    """InvalidArgument unless kv_buffers `a` and `b` differ at most in how
    many pages they hold (same geometry, layout and item size)."""
    axis, _ = page_axis(layout, mha)
    shape_a, shape_b = list(_raw(a).shape), list(_raw(b).shape)
    if len(shape_a) != len(shape_b) or (shape_a[:axis] + shape_a[axis + 1:]
                                        != shape_b[:axis] + shape_b[axis + 1:]):
        raise errors.InvalidArgument(
            f"host buffers of shapes {tuple(a.shape)} ({a.dtype}) and "
            f"{tuple(b.shape)} ({b.dtype}) do not hold the same pages of {layout}")


def copy_pages(dst, dst_pages, src, src_pages, layout, mha, page_size):
    """Copies page src_pages[i] of `src` into page dst_pages[i] of `dst`
    (page numbers; REQUIRES: check_same_pages(dst, src), equal counts).
    Runs of pages consecutive on both sides are one copy_ between views: no
    temporary (a gathered batch of tens of MiB would be fresh memory, page
    faults and all, on every call)."""
    axis, per_token = page_axis(layout, mha)
    src_pages = [int(p) for p in _torch().as_tensor(src_pages).flatten().tolist()]
    dst_pages = [int(p) for p in _torch().as_tensor(dst_pages).flatten().tolist()]
    if len(src_pages) != len(dst_pages):
        raise errors.InvalidArgument(
            f"{len(src_pages)} source pages but {len(dst_pages)} destination pages")
    if not src_pages:
        return
    unit = page_size if per_token else 1
    raw_src, raw_dst = _raw(src), _raw(dst)
    first, count = 0, 1
    for i in range(1, len(src_pages) + 1):
        if (i < len(src_pages) and src_pages[i] == src_pages[first] + count
                and dst_pages[i] == dst_pages[first] + count):
            count += 1
            continue
        raw_dst.narrow(axis, dst_pages[first] * unit, count * unit).copy_(
            raw_src.narrow(axis, src_pages[first] * unit, count * unit))
        if i < len(src_pages):
            first, count = i, 1


def page_view(buf, layout, mha, index, page_size):
    """The page starting at token slot `index` of kv_buffer `buf`, in the
    layout's own axis order (what SGLang's get_data_page flattens)."""
    axis, per_token = page_axis(layout, mha)
    start, stop = (index, index + page_size) if per_token else (
        index // page_size, index // page_size + 1)
    return buf.narrow(axis, start, stop - start)
