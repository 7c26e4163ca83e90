"""User-facing errors.

Everything the package refuses on purpose is a :class:`FusionExtError` whose message is one line naming the
problem (file, node, op, input, shape or target). The CLI prints ``error: <message>`` and exits non-zero;
library users can catch the class. Errors from deep inside TVM are wrapped at the boundary where we know
what the user asked for, never shown raw.
"""


class FusionExtError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class ModelLoadError(FusionExtError):
    """The model file cannot be read or imported (missing, truncated, unsupported op, dynamic shape)."""


class InputError(FusionExtError):
    """Runtime inputs do not fit the model (names, shapes, dtypes, token ids)."""


class TargetError(FusionExtError):
    """Unknown or unsupported target / architecture."""


class TuningLogError(FusionExtError):
    """A tuning-log directory is corrupt or belongs to another model/target."""


class ArtifactError(FusionExtError):
    """A compiled artifact cannot be written or loaded (see the two kinds below)."""


class CorruptArtifactError(ArtifactError):
    """An artifact's files are missing, truncated or changed since they were written (checksums differ)."""


class IncompatibleArtifactError(ArtifactError):
    """An intact artifact that this machine cannot run: another artifact format or TVM version, CPU features
    this CPU lacks, a GPU that is not there."""


class CompilerMissingError(FusionExtError):
    """This TVM is runtime-only (no ``libtvm_compiler.so``, or ``TVM_USE_RUNTIME_LIB=1``) and the command compiles."""
