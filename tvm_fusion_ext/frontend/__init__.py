"""ONNX → Relax: TVM's ONNX importer with static or bounded input shapes, fixed converters and one-line errors."""

from .importer import (ONNX_INPUT_NAMES_ATTR, ONNX_OUTPUT_NAMES_ATTR, NodeImportError, input_names, input_specs,
                       load_onnx, output_names, parse_shape_arg)

__all__ = ["ONNX_INPUT_NAMES_ATTR", "ONNX_OUTPUT_NAMES_ATTR", "NodeImportError", "input_names", "input_specs",
           "load_onnx", "output_names", "parse_shape_arg"]
