"""The importer's errors, at the bottom of the front end (this module imports nothing else from it).

:class:`Unsupported` is what a converter raises for an input it cannot convert correctly; the importer turns it
into a :class:`ModelLoadError` naming the file, the op and the node. :class:`NodeImportError` is TVM's own
converter failing on a node (not one of our refusals). :class:`ModelLoadError` and :class:`InputError` are the
package's (:mod:`tvm_fusion_ext.errors`), re-exported so front-end modules take every error from here.
"""

from __future__ import annotations

from ..errors import InputError, ModelLoadError


class Unsupported(Exception):
    """Raised by a converter for an input it cannot convert correctly; the importer names the op and node."""


class NodeImportError(ModelLoadError):
    """TVM's converter failed on a node (not one of our refusals): the file itself may be what is wrong."""


__all__ = ["InputError", "ModelLoadError", "NodeImportError", "Unsupported"]
