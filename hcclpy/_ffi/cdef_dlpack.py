"""DLPack's tensor description (dlpack.h), as cffi declarations: what :mod:`.dlpack` reads of a
capsule."""

TYPES = """
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data; DLDevice device; int32_t ndim; DLDataType dtype;
    int64_t *shape; int64_t *strides; uint64_t byte_offset;
} DLTensor;
typedef struct { DLTensor dl_tensor; void *manager_ctx; void *deleter; } DLManagedTensor;
"""
