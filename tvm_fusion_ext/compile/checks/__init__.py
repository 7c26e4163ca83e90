"""Run-time refusals :func:`~tvm_fusion_ext.compile.lower.lower` inserts: a bad input (a token id past the table,
a mask shorter than the cache, lengths the export named apart that differ) ends in one clear error, never a read
past a buffer. One check per module; the table in :mod:`tvm_fusion_ext.compile` lists them."""
