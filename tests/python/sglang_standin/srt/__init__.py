"""Stand-in of python/sglang/srt at 001067fffe33427bee0ed2f007fb7551a1d76b44
(a package marker: the tree's layout; each module names the file and
commit it models)."""
