"""Router mode: remote engines behind the same engine protocol as the local one.

`Fleet` holds the replicas (health, load, rendezvous affinity, drain); `RemoteEngine` is one
model served by the fleet, whose generations fail over to another replica mid-answer;
`ClusterModels` is the chat layer's model provider for local and remote engines together;
`chatbox.cluster.replica` is the server side (`chatbox replica`).
"""

from __future__ import annotations

from chatbox.cluster.admin import ReplicaAdmin
from chatbox.cluster.fleet import Fleet
from chatbox.cluster.provider import ClusterModels

__all__ = ["ClusterModels", "Fleet", "ReplicaAdmin"]
