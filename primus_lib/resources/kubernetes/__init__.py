"""The Kubernetes backend: PrimusJob custom resource + Indexed Job / PyTorchJob + StatefulSets."""

from __future__ import annotations
