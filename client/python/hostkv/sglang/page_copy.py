"""Whole pages between two SGLang-shaped host kv_buffers of one layout.

SGLang's host kv_buffer keeps its pages along one axis: token rows
(layer_first, page_first: a page is page_size consecutive rows) or page
blocks (page_first_direct, page_head: one index per page). Two buffers of
the same geometry and layout, of any sizes (the engine's host pool and a
hostkvd pool's mapping), then exchange pages with one index_select and one
index_copy_ on that axis, as raw bytes (fp8 kept as uint8 and as float8
alike). Shapes: hostkv.pool_mapping.sglang_shape.
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


def _rows(pages, page_size, per_token):
    torch = _torch()
    pages = torch.as_tensor(pages, dtype=torch.int64).flatten()
    if not per_token:
        return pages
    return (pages.unsqueeze(1) * page_size + torch.arange(page_size)).flatten()


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
    (page numbers; REQUIRES: check_same_pages(dst, src), equal counts)."""
    axis, per_token = page_axis(layout, mha)
    rows_src = _rows(src_pages, page_size, per_token)
    rows_dst = _rows(dst_pages, page_size, per_token)
    if rows_src.numel() != rows_dst.numel():
        raise errors.InvalidArgument(
            f"{len(src_pages)} source pages but {len(dst_pages)} destination pages")
    if rows_src.numel() == 0:
        return
    _raw(dst).index_copy_(axis, rows_dst, _raw(src).index_select(axis, rows_src))


def page_view(buf, layout, mha, index, page_size):
    """The page starting at token slot `index` of kv_buffer `buf`, in the
    layout's own axis order (what SGLang's get_data_page flattens)."""
    axis, per_token = page_axis(layout, mha)
    start, stop = (index, index + page_size) if per_token else (
        index // page_size, index // page_size + 1)
    return buf.narrow(axis, start, stop - start)
