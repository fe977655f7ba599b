"""A Protobuf message type as ``protoc`` would generate it into a module: ``segacktests.Order``
(``user``, ``seq``, ``amount``), importable by the tasks a sink is pickled into, as a user's
``_pb2`` module is. Made from its descriptor here, since the tests have no ``protoc``; its file has
no options, which Karapace 6.2 cannot serve in the serialized form segack reads."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_KINDS = descriptor_pb2.FieldDescriptorProto
_FILE = descriptor_pb2.FileDescriptorProto(name="segack_tests_order.proto", package="segacktests",
                                           syntax="proto3")
_ORDER = _FILE.message_type.add(name="Order")
for _number, (_name, _kind) in enumerate([("user", _KINDS.TYPE_STRING), ("seq", _KINDS.TYPE_INT64),
                                          ("amount", _KINDS.TYPE_INT64)], start=1):
    _ORDER.field.add(name=_name, number=_number, type=_kind, label=_KINDS.LABEL_OPTIONAL)
_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_FILE)

Order = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("segacktests.Order"))
Order.__module__ = __name__  # pickled by reference, as a generated module's classes are
