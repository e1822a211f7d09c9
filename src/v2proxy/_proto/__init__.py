"""Protocol definitions and the Python code generated from them (tools/gen_proto.sh)."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
