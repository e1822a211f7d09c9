"""Protocol definitions and the Python code generated from them (tools/gen_proto.sh).

The generated messages live in :data:`POOL`, a descriptor pool of v2proxy's own, so that they
never clash with the same ``inference.*`` names that tritonclient or KServe register in
protobuf's default pool when loaded in the same process.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
