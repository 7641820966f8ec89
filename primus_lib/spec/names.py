"""The shapes of spec values that leave Primus for another system's names: Kubernetes objects,
namespaces and labels, container images, Airflow connections, YARN queues and Kafka topics.

Each rule is the other system's own (or a subset of it), matched against the whole value:
``fullmatch``, because ``$`` would also match before a trailing newline.
"""

from __future__ import annotations

import re

_LABEL_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"  # docker's reference grammar (distribution/reference)
_DOMAIN = r"[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?)*(?::[0-9]+)?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

ROLE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,62}")  # becomes process, pod and directory names
DNS_LABEL = re.compile(_DNS_LABEL)  # Kubernetes namespaces (RFC 1123 label)
LABEL_KEY = re.compile(rf"(?:{_DNS_LABEL}(?:\.{_DNS_LABEL})*/)?{_LABEL_NAME}")  # [prefix/]name
LABEL_VALUE = re.compile(rf"(?:{_LABEL_NAME})?")
CLUSTER_NAME = re.compile(_LABEL_NAME)
IMAGE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*(?::{_TAG})?(?:@{_DIGEST})?")
CONNECTION_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")  # Airflow's rule for connection ids (ASCII)
YARN_QUEUE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")  # a leaf or a path: root.ads.ctr
KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # Kafka's own rule for topic names
MAX_IMAGE = 255 + 1 + 128 + 1 + 71 + 64  # name, tag and a sha512 digest
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def has_control(text: str) -> bool:
    """A newline, tab, NUL or other control character: never part of a path, name or URL."""
    return _CONTROL.search(text) is not None


def matches(pattern: re.Pattern[str], value: str) -> bool:
    return pattern.fullmatch(value) is not None


def is_image(value: str) -> bool:
    return len(value) <= MAX_IMAGE and matches(IMAGE, value)


def is_label_key(value: str) -> bool:
    prefix, _, name = value.rpartition("/")
    return len(prefix) <= 253 and matches(LABEL_KEY, value) and len(name) <= 63


def is_topic(value: str) -> bool:
    return matches(KAFKA_TOPIC, value) and value not in {".", ".."}
