"""``monarch.rdma``'s public names (its ``__all__``), each mapped onto mpimesh's."""

from mpimesh import RDMAAction as RDMAAction
from mpimesh import RDMABuffer as RDMABuffer
from mpimesh import RDMAReadTransferWarning as RDMAReadTransferWarning
from mpimesh import RDMATcpFallbackWarning as RDMATcpFallbackWarning
from mpimesh import RDMAWriteTransferWarning as RDMAWriteTransferWarning
from mpimesh import get_rdma_backend as get_rdma_backend
from mpimesh import is_ibverbs_available as is_ibverbs_available
from mpimesh import is_rdma_available as is_rdma_available
