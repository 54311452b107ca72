"""Stores on message brokers: RabbitMQ (``amqp://``) and Amazon SQS (``sqs://``). The broker
carries each job as a message; ``core.BrokerBackend`` keeps its lifecycle; a transport per
broker moves the messages (``transport.Transport``)."""

from .core import MISSING, BrokerBackend
from .transport import Delivery, Lane, LaneDepth, Outgoing, Transport

__all__ = ["MISSING", "BrokerBackend", "Delivery", "Lane", "LaneDepth", "Outgoing", "Transport"]
