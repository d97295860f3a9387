"""Adapter-format validation shared by the registry and the inference agent.

Pure Python, no numpy: safetensors and archives are parsed here, strictly,
in bounded chunks.
"""

from loraplane.lora.archive import extract_archive
from loraplane.lora.base_model import (
    SUPPORTED_MODEL_TYPES,
    BaseModelShapes,
    UnsupportedBaseModel,
    check_against_base,
)
from loraplane.lora.errors import ERROR_CODES, TOO_LARGE_CODES, AdapterInvalid
from loraplane.lora.files import ALLOWED_FILES, CONFIG_FILE, IGNORED_FILES, WEIGHTS_FILE
from loraplane.lora.peft_config import LoraConfig, parse_lora_config
from loraplane.lora.safetensors import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_HEADER_BYTES,
    FLOAT_DTYPES,
    SafetensorsHeader,
    TensorInfo,
    check_float_dtypes,
    read_header,
    scan_finite,
)
from loraplane.lora.tensors import LoraModule, TensorSummary, check_tensors
from loraplane.lora.validate import AdapterSummary, validate_adapter_dir

__all__ = [
    "ALLOWED_FILES",
    "CONFIG_FILE",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_HEADER_BYTES",
    "ERROR_CODES",
    "FLOAT_DTYPES",
    "IGNORED_FILES",
    "SUPPORTED_MODEL_TYPES",
    "TOO_LARGE_CODES",
    "WEIGHTS_FILE",
    "AdapterInvalid",
    "AdapterSummary",
    "BaseModelShapes",
    "LoraConfig",
    "LoraModule",
    "SafetensorsHeader",
    "TensorInfo",
    "TensorSummary",
    "UnsupportedBaseModel",
    "check_against_base",
    "check_float_dtypes",
    "check_tensors",
    "extract_archive",
    "parse_lora_config",
    "read_header",
    "scan_finite",
    "validate_adapter_dir",
]
