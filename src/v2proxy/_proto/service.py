"""The unary RPCs of ``inference.GRPCInferenceService`` and their message types: the one table
both the gRPC frontend (server handlers) and the gRPC backend (client calls) are built from.
ModelStreamInfer, the one streaming RPC, is wired separately by each side."""

from __future__ import annotations

from typing import Any

from v2proxy._proto import grpc_service_pb2 as pb

SERVICE = "inference.GRPCInferenceService"

UNARY_RPCS: dict[str, tuple[Any, Any]] = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
    "SystemSharedMemoryStatus": (
        pb.SystemSharedMemoryStatusRequest,
        pb.SystemSharedMemoryStatusResponse,
    ),
    "SystemSharedMemoryRegister": (
        pb.SystemSharedMemoryRegisterRequest,
        pb.SystemSharedMemoryRegisterResponse,
    ),
    "SystemSharedMemoryUnregister": (
        pb.SystemSharedMemoryUnregisterRequest,
        pb.SystemSharedMemoryUnregisterResponse,
    ),
    "CudaSharedMemoryStatus": (pb.CudaSharedMemoryStatusRequest, pb.CudaSharedMemoryStatusResponse),
    "CudaSharedMemoryRegister": (
        pb.CudaSharedMemoryRegisterRequest,
        pb.CudaSharedMemoryRegisterResponse,
    ),
    "CudaSharedMemoryUnregister": (
        pb.CudaSharedMemoryUnregisterRequest,
        pb.CudaSharedMemoryUnregisterResponse,
    ),
    "TraceSetting": (pb.TraceSettingRequest, pb.TraceSettingResponse),
    "LogSettings": (pb.LogSettingsRequest, pb.LogSettingsResponse),
}
