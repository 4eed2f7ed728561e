"""Kafka protocol messages, generated from the JSON definitions of Apache Kafka
4.3.1 by tools/generate_protocol.py. Do not edit; regenerate instead.

One module per definition (``metadata_request``, ``consumer_protocol_subscription``, ...).
Nothing is imported until asked for: ``request_class(3)``, ``response_class(3)``,
``message_class("MetadataRequest")`` or ``messages.MetadataRequest`` import on first use.
"""

from __future__ import annotations

import importlib
from enum import IntEnum
from typing import Any, NamedTuple


class ApiKey(IntEnum):
    """Every API key by its name in Java's ``ApiKeys`` (``ApiKey.METADATA == 3``). Members are
    ints, so they go on the wire and compare with decoded keys as they are."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    ALTER_REPLICA_LOG_DIRS = 34
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    CREATE_DELEGATION_TOKEN = 38
    RENEW_DELEGATION_TOKEN = 39
    EXPIRE_DELEGATION_TOKEN = 40
    DESCRIBE_DELEGATION_TOKEN = 41
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    OFFSET_DELETE = 47
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    VOTE = 52
    BEGIN_QUORUM_EPOCH = 53
    END_QUORUM_EPOCH = 54
    DESCRIBE_QUORUM = 55
    ALTER_PARTITION = 56
    UPDATE_FEATURES = 57
    ENVELOPE = 58
    FETCH_SNAPSHOT = 59
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    BROKER_REGISTRATION = 62
    BROKER_HEARTBEAT = 63
    UNREGISTER_BROKER = 64
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    ALLOCATE_PRODUCER_IDS = 67
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    CONTROLLER_REGISTRATION = 70
    GET_TELEMETRY_SUBSCRIPTIONS = 71
    PUSH_TELEMETRY = 72
    ASSIGN_REPLICAS_TO_DIRS = 73
    LIST_CONFIG_RESOURCES = 74
    DESCRIBE_TOPIC_PARTITIONS = 75
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    ADD_RAFT_VOTER = 80
    REMOVE_RAFT_VOTER = 81
    UPDATE_RAFT_VOTER = 82
    INITIALIZE_SHARE_GROUP_STATE = 83
    READ_SHARE_GROUP_STATE = 84
    WRITE_SHARE_GROUP_STATE = 85
    DELETE_SHARE_GROUP_STATE = 86
    READ_SHARE_GROUP_STATE_SUMMARY = 87
    STREAMS_GROUP_HEARTBEAT = 88
    STREAMS_GROUP_DESCRIBE = 89
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


class ApiInfo(NamedTuple):
    """One Kafka API: its key, name, message classes and supported versions."""

    api_key: int
    name: str
    request: str  # request class name
    response: str  # response class name
    valid_versions: tuple[int, int] | None  # None: every version was removed
    flexible_versions: int | None  # first flexible version, if any
    latest_version_unstable: bool  # the highest version is still in development

    @property
    def max_stable_version(self) -> int | None:
        """The highest version a client should use unless it opts into unstable ones."""
        if self.valid_versions is None:
            return None
        lo, hi = self.valid_versions
        if self.latest_version_unstable and hi > lo:
            return hi - 1
        return hi


APIS: dict[int, ApiInfo] = {
    0: ApiInfo(0, "Produce", "ProduceRequest", "ProduceResponse", (3, 13), 9, False),
    1: ApiInfo(1, "Fetch", "FetchRequest", "FetchResponse", (4, 18), 12, False),
    2: ApiInfo(2, "ListOffsets", "ListOffsetsRequest", "ListOffsetsResponse", (1, 11), 6, False),
    3: ApiInfo(3, "Metadata", "MetadataRequest", "MetadataResponse", (0, 13), 9, False),
    4: ApiInfo(4, "LeaderAndIsr", "LeaderAndIsrRequest", "LeaderAndIsrResponse", None, None, False),
    5: ApiInfo(5, "StopReplica", "StopReplicaRequest", "StopReplicaResponse", None, None, False),
    6: ApiInfo(
        6, "UpdateMetadata", "UpdateMetadataRequest", "UpdateMetadataResponse", None, None, False
    ),
    7: ApiInfo(
        7,
        "ControlledShutdown",
        "ControlledShutdownRequest",
        "ControlledShutdownResponse",
        None,
        None,
        False,
    ),
    8: ApiInfo(8, "OffsetCommit", "OffsetCommitRequest", "OffsetCommitResponse", (2, 10), 8, False),
    9: ApiInfo(9, "OffsetFetch", "OffsetFetchRequest", "OffsetFetchResponse", (1, 10), 6, False),
    10: ApiInfo(
        10, "FindCoordinator", "FindCoordinatorRequest", "FindCoordinatorResponse", (0, 6), 3, False
    ),
    11: ApiInfo(11, "JoinGroup", "JoinGroupRequest", "JoinGroupResponse", (0, 9), 6, False),
    12: ApiInfo(12, "Heartbeat", "HeartbeatRequest", "HeartbeatResponse", (0, 4), 4, False),
    13: ApiInfo(13, "LeaveGroup", "LeaveGroupRequest", "LeaveGroupResponse", (0, 5), 4, False),
    14: ApiInfo(14, "SyncGroup", "SyncGroupRequest", "SyncGroupResponse", (0, 5), 4, False),
    15: ApiInfo(
        15, "DescribeGroups", "DescribeGroupsRequest", "DescribeGroupsResponse", (0, 6), 5, False
    ),
    16: ApiInfo(16, "ListGroups", "ListGroupsRequest", "ListGroupsResponse", (0, 5), 3, False),
    17: ApiInfo(
        17, "SaslHandshake", "SaslHandshakeRequest", "SaslHandshakeResponse", (0, 1), None, False
    ),
    18: ApiInfo(18, "ApiVersions", "ApiVersionsRequest", "ApiVersionsResponse", (0, 4), 3, False),
    19: ApiInfo(
        19, "CreateTopics", "CreateTopicsRequest", "CreateTopicsResponse", (2, 7), 5, False
    ),
    20: ApiInfo(
        20, "DeleteTopics", "DeleteTopicsRequest", "DeleteTopicsResponse", (1, 6), 4, False
    ),
    21: ApiInfo(
        21, "DeleteRecords", "DeleteRecordsRequest", "DeleteRecordsResponse", (0, 2), 2, False
    ),
    22: ApiInfo(
        22, "InitProducerId", "InitProducerIdRequest", "InitProducerIdResponse", (0, 6), 2, True
    ),
    23: ApiInfo(
        23,
        "OffsetForLeaderEpoch",
        "OffsetForLeaderEpochRequest",
        "OffsetForLeaderEpochResponse",
        (2, 4),
        4,
        False,
    ),
    24: ApiInfo(
        24,
        "AddPartitionsToTxn",
        "AddPartitionsToTxnRequest",
        "AddPartitionsToTxnResponse",
        (0, 5),
        3,
        False,
    ),
    25: ApiInfo(
        25, "AddOffsetsToTxn", "AddOffsetsToTxnRequest", "AddOffsetsToTxnResponse", (0, 4), 3, False
    ),
    26: ApiInfo(26, "EndTxn", "EndTxnRequest", "EndTxnResponse", (0, 5), 3, False),
    27: ApiInfo(
        27, "WriteTxnMarkers", "WriteTxnMarkersRequest", "WriteTxnMarkersResponse", (1, 2), 1, False
    ),
    28: ApiInfo(
        28, "TxnOffsetCommit", "TxnOffsetCommitRequest", "TxnOffsetCommitResponse", (0, 5), 3, False
    ),
    29: ApiInfo(
        29, "DescribeAcls", "DescribeAclsRequest", "DescribeAclsResponse", (1, 3), 2, False
    ),
    30: ApiInfo(30, "CreateAcls", "CreateAclsRequest", "CreateAclsResponse", (1, 3), 2, False),
    31: ApiInfo(31, "DeleteAcls", "DeleteAclsRequest", "DeleteAclsResponse", (1, 3), 2, False),
    32: ApiInfo(
        32, "DescribeConfigs", "DescribeConfigsRequest", "DescribeConfigsResponse", (1, 4), 4, False
    ),
    33: ApiInfo(
        33, "AlterConfigs", "AlterConfigsRequest", "AlterConfigsResponse", (0, 2), 2, False
    ),
    34: ApiInfo(
        34,
        "AlterReplicaLogDirs",
        "AlterReplicaLogDirsRequest",
        "AlterReplicaLogDirsResponse",
        (1, 2),
        2,
        False,
    ),
    35: ApiInfo(
        35, "DescribeLogDirs", "DescribeLogDirsRequest", "DescribeLogDirsResponse", (1, 5), 2, False
    ),
    36: ApiInfo(
        36,
        "SaslAuthenticate",
        "SaslAuthenticateRequest",
        "SaslAuthenticateResponse",
        (0, 2),
        2,
        False,
    ),
    37: ApiInfo(
        37,
        "CreatePartitions",
        "CreatePartitionsRequest",
        "CreatePartitionsResponse",
        (0, 3),
        2,
        False,
    ),
    38: ApiInfo(
        38,
        "CreateDelegationToken",
        "CreateDelegationTokenRequest",
        "CreateDelegationTokenResponse",
        (1, 3),
        2,
        False,
    ),
    39: ApiInfo(
        39,
        "RenewDelegationToken",
        "RenewDelegationTokenRequest",
        "RenewDelegationTokenResponse",
        (1, 2),
        2,
        False,
    ),
    40: ApiInfo(
        40,
        "ExpireDelegationToken",
        "ExpireDelegationTokenRequest",
        "ExpireDelegationTokenResponse",
        (1, 2),
        2,
        False,
    ),
    41: ApiInfo(
        41,
        "DescribeDelegationToken",
        "DescribeDelegationTokenRequest",
        "DescribeDelegationTokenResponse",
        (1, 3),
        2,
        False,
    ),
    42: ApiInfo(
        42, "DeleteGroups", "DeleteGroupsRequest", "DeleteGroupsResponse", (0, 2), 2, False
    ),
    43: ApiInfo(
        43, "ElectLeaders", "ElectLeadersRequest", "ElectLeadersResponse", (0, 2), 2, False
    ),
    44: ApiInfo(
        44,
        "IncrementalAlterConfigs",
        "IncrementalAlterConfigsRequest",
        "IncrementalAlterConfigsResponse",
        (0, 1),
        1,
        False,
    ),
    45: ApiInfo(
        45,
        "AlterPartitionReassignments",
        "AlterPartitionReassignmentsRequest",
        "AlterPartitionReassignmentsResponse",
        (0, 1),
        0,
        False,
    ),
    46: ApiInfo(
        46,
        "ListPartitionReassignments",
        "ListPartitionReassignmentsRequest",
        "ListPartitionReassignmentsResponse",
        (0, 0),
        0,
        False,
    ),
    47: ApiInfo(
        47, "OffsetDelete", "OffsetDeleteRequest", "OffsetDeleteResponse", (0, 0), None, False
    ),
    48: ApiInfo(
        48,
        "DescribeClientQuotas",
        "DescribeClientQuotasRequest",
        "DescribeClientQuotasResponse",
        (0, 1),
        1,
        False,
    ),
    49: ApiInfo(
        49,
        "AlterClientQuotas",
        "AlterClientQuotasRequest",
        "AlterClientQuotasResponse",
        (0, 1),
        1,
        False,
    ),
    50: ApiInfo(
        50,
        "DescribeUserScramCredentials",
        "DescribeUserScramCredentialsRequest",
        "DescribeUserScramCredentialsResponse",
        (0, 0),
        0,
        False,
    ),
    51: ApiInfo(
        51,
        "AlterUserScramCredentials",
        "AlterUserScramCredentialsRequest",
        "AlterUserScramCredentialsResponse",
        (0, 0),
        0,
        False,
    ),
    52: ApiInfo(52, "Vote", "VoteRequest", "VoteResponse", (0, 2), 0, False),
    53: ApiInfo(
        53,
        "BeginQuorumEpoch",
        "BeginQuorumEpochRequest",
        "BeginQuorumEpochResponse",
        (0, 1),
        1,
        False,
    ),
    54: ApiInfo(
        54, "EndQuorumEpoch", "EndQuorumEpochRequest", "EndQuorumEpochResponse", (0, 1), 1, False
    ),
    55: ApiInfo(
        55, "DescribeQuorum", "DescribeQuorumRequest", "DescribeQuorumResponse", (0, 2), 0, False
    ),
    56: ApiInfo(
        56, "AlterPartition", "AlterPartitionRequest", "AlterPartitionResponse", (2, 3), 0, False
    ),
    57: ApiInfo(
        57, "UpdateFeatures", "UpdateFeaturesRequest", "UpdateFeaturesResponse", (0, 2), 0, False
    ),
    58: ApiInfo(58, "Envelope", "EnvelopeRequest", "EnvelopeResponse", (0, 0), 0, False),
    59: ApiInfo(
        59, "FetchSnapshot", "FetchSnapshotRequest", "FetchSnapshotResponse", (0, 1), 0, False
    ),
    60: ApiInfo(
        60, "DescribeCluster", "DescribeClusterRequest", "DescribeClusterResponse", (0, 2), 0, False
    ),
    61: ApiInfo(
        61,
        "DescribeProducers",
        "DescribeProducersRequest",
        "DescribeProducersResponse",
        (0, 0),
        0,
        False,
    ),
    62: ApiInfo(
        62,
        "BrokerRegistration",
        "BrokerRegistrationRequest",
        "BrokerRegistrationResponse",
        (0, 4),
        0,
        False,
    ),
    63: ApiInfo(
        63, "BrokerHeartbeat", "BrokerHeartbeatRequest", "BrokerHeartbeatResponse", (0, 2), 0, False
    ),
    64: ApiInfo(
        64,
        "UnregisterBroker",
        "UnregisterBrokerRequest",
        "UnregisterBrokerResponse",
        (0, 0),
        0,
        False,
    ),
    65: ApiInfo(
        65,
        "DescribeTransactions",
        "DescribeTransactionsRequest",
        "DescribeTransactionsResponse",
        (0, 0),
        0,
        False,
    ),
    66: ApiInfo(
        66,
        "ListTransactions",
        "ListTransactionsRequest",
        "ListTransactionsResponse",
        (0, 2),
        0,
        False,
    ),
    67: ApiInfo(
        67,
        "AllocateProducerIds",
        "AllocateProducerIdsRequest",
        "AllocateProducerIdsResponse",
        (0, 0),
        0,
        False,
    ),
    68: ApiInfo(
        68,
        "ConsumerGroupHeartbeat",
        "ConsumerGroupHeartbeatRequest",
        "ConsumerGroupHeartbeatResponse",
        (0, 1),
        0,
        False,
    ),
    69: ApiInfo(
        69,
        "ConsumerGroupDescribe",
        "ConsumerGroupDescribeRequest",
        "ConsumerGroupDescribeResponse",
        (0, 1),
        0,
        False,
    ),
    70: ApiInfo(
        70,
        "ControllerRegistration",
        "ControllerRegistrationRequest",
        "ControllerRegistrationResponse",
        (0, 0),
        0,
        False,
    ),
    71: ApiInfo(
        71,
        "GetTelemetrySubscriptions",
        "GetTelemetrySubscriptionsRequest",
        "GetTelemetrySubscriptionsResponse",
        (0, 0),
        0,
        False,
    ),
    72: ApiInfo(
        72, "PushTelemetry", "PushTelemetryRequest", "PushTelemetryResponse", (0, 0), 0, False
    ),
    73: ApiInfo(
        73,
        "AssignReplicasToDirs",
        "AssignReplicasToDirsRequest",
        "AssignReplicasToDirsResponse",
        (0, 0),
        0,
        False,
    ),
    74: ApiInfo(
        74,
        "ListConfigResources",
        "ListConfigResourcesRequest",
        "ListConfigResourcesResponse",
        (0, 1),
        0,
        False,
    ),
    75: ApiInfo(
        75,
        "DescribeTopicPartitions",
        "DescribeTopicPartitionsRequest",
        "DescribeTopicPartitionsResponse",
        (0, 0),
        0,
        False,
    ),
    76: ApiInfo(
        76,
        "ShareGroupHeartbeat",
        "ShareGroupHeartbeatRequest",
        "ShareGroupHeartbeatResponse",
        (1, 1),
        0,
        False,
    ),
    77: ApiInfo(
        77,
        "ShareGroupDescribe",
        "ShareGroupDescribeRequest",
        "ShareGroupDescribeResponse",
        (1, 1),
        0,
        False,
    ),
    78: ApiInfo(78, "ShareFetch", "ShareFetchRequest", "ShareFetchResponse", (1, 2), 0, False),
    79: ApiInfo(
        79,
        "ShareAcknowledge",
        "ShareAcknowledgeRequest",
        "ShareAcknowledgeResponse",
        (1, 2),
        0,
        False,
    ),
    80: ApiInfo(
        80, "AddRaftVoter", "AddRaftVoterRequest", "AddRaftVoterResponse", (0, 1), 0, False
    ),
    81: ApiInfo(
        81, "RemoveRaftVoter", "RemoveRaftVoterRequest", "RemoveRaftVoterResponse", (0, 0), 0, False
    ),
    82: ApiInfo(
        82, "UpdateRaftVoter", "UpdateRaftVoterRequest", "UpdateRaftVoterResponse", (0, 0), 0, False
    ),
    83: ApiInfo(
        83,
        "InitializeShareGroupState",
        "InitializeShareGroupStateRequest",
        "InitializeShareGroupStateResponse",
        (0, 0),
        0,
        False,
    ),
    84: ApiInfo(
        84,
        "ReadShareGroupState",
        "ReadShareGroupStateRequest",
        "ReadShareGroupStateResponse",
        (0, 0),
        0,
        False,
    ),
    85: ApiInfo(
        85,
        "WriteShareGroupState",
        "WriteShareGroupStateRequest",
        "WriteShareGroupStateResponse",
        (0, 1),
        0,
        False,
    ),
    86: ApiInfo(
        86,
        "DeleteShareGroupState",
        "DeleteShareGroupStateRequest",
        "DeleteShareGroupStateResponse",
        (0, 0),
        0,
        False,
    ),
    87: ApiInfo(
        87,
        "ReadShareGroupStateSummary",
        "ReadShareGroupStateSummaryRequest",
        "ReadShareGroupStateSummaryResponse",
        (0, 1),
        0,
        False,
    ),
    88: ApiInfo(
        88,
        "StreamsGroupHeartbeat",
        "StreamsGroupHeartbeatRequest",
        "StreamsGroupHeartbeatResponse",
        (0, 0),
        0,
        False,
    ),
    89: ApiInfo(
        89,
        "StreamsGroupDescribe",
        "StreamsGroupDescribeRequest",
        "StreamsGroupDescribeResponse",
        (0, 0),
        0,
        False,
    ),
    90: ApiInfo(
        90,
        "DescribeShareGroupOffsets",
        "DescribeShareGroupOffsetsRequest",
        "DescribeShareGroupOffsetsResponse",
        (0, 1),
        0,
        False,
    ),
    91: ApiInfo(
        91,
        "AlterShareGroupOffsets",
        "AlterShareGroupOffsetsRequest",
        "AlterShareGroupOffsetsResponse",
        (0, 0),
        0,
        False,
    ),
    92: ApiInfo(
        92,
        "DeleteShareGroupOffsets",
        "DeleteShareGroupOffsetsRequest",
        "DeleteShareGroupOffsetsResponse",
        (0, 0),
        0,
        False,
    ),
}

# API name -> key, e.g. API_KEYS["Metadata"] == 3.
API_KEYS: dict[str, int] = {info.name: key for key, info in APIS.items()}

# Class name -> module name, for every generated top-level message class.
MESSAGES: dict[str, str] = {
    "AddOffsetsToTxnRequest": "add_offsets_to_txn_request",
    "AddOffsetsToTxnResponse": "add_offsets_to_txn_response",
    "AddPartitionsToTxnRequest": "add_partitions_to_txn_request",
    "AddPartitionsToTxnResponse": "add_partitions_to_txn_response",
    "AddRaftVoterRequest": "add_raft_voter_request",
    "AddRaftVoterResponse": "add_raft_voter_response",
    "AllocateProducerIdsRequest": "allocate_producer_ids_request",
    "AllocateProducerIdsResponse": "allocate_producer_ids_response",
    "AlterClientQuotasRequest": "alter_client_quotas_request",
    "AlterClientQuotasResponse": "alter_client_quotas_response",
    "AlterConfigsRequest": "alter_configs_request",
    "AlterConfigsResponse": "alter_configs_response",
    "AlterPartitionReassignmentsRequest": "alter_partition_reassignments_request",
    "AlterPartitionReassignmentsResponse": "alter_partition_reassignments_response",
    "AlterPartitionRequest": "alter_partition_request",
    "AlterPartitionResponse": "alter_partition_response",
    "AlterReplicaLogDirsRequest": "alter_replica_log_dirs_request",
    "AlterReplicaLogDirsResponse": "alter_replica_log_dirs_response",
    "AlterShareGroupOffsetsRequest": "alter_share_group_offsets_request",
    "AlterShareGroupOffsetsResponse": "alter_share_group_offsets_response",
    "AlterUserScramCredentialsRequest": "alter_user_scram_credentials_request",
    "AlterUserScramCredentialsResponse": "alter_user_scram_credentials_response",
    "ApiVersionsRequest": "api_versions_request",
    "ApiVersionsResponse": "api_versions_response",
    "AssignReplicasToDirsRequest": "assign_replicas_to_dirs_request",
    "AssignReplicasToDirsResponse": "assign_replicas_to_dirs_response",
    "BeginQuorumEpochRequest": "begin_quorum_epoch_request",
    "BeginQuorumEpochResponse": "begin_quorum_epoch_response",
    "BrokerHeartbeatRequest": "broker_heartbeat_request",
    "BrokerHeartbeatResponse": "broker_heartbeat_response",
    "BrokerRegistrationRequest": "broker_registration_request",
    "BrokerRegistrationResponse": "broker_registration_response",
    "ConsumerGroupDescribeRequest": "consumer_group_describe_request",
    "ConsumerGroupDescribeResponse": "consumer_group_describe_response",
    "ConsumerGroupHeartbeatRequest": "consumer_group_heartbeat_request",
    "ConsumerGroupHeartbeatResponse": "consumer_group_heartbeat_response",
    "ConsumerProtocolAssignment": "consumer_protocol_assignment",
    "ConsumerProtocolSubscription": "consumer_protocol_subscription",
    "ControlRecordTypeSchema": "control_record_type_schema",
    "ControlledShutdownRequest": "controlled_shutdown_request",
    "ControlledShutdownResponse": "controlled_shutdown_response",
    "ControllerRegistrationRequest": "controller_registration_request",
    "ControllerRegistrationResponse": "controller_registration_response",
    "CreateAclsRequest": "create_acls_request",
    "CreateAclsResponse": "create_acls_response",
    "CreateDelegationTokenRequest": "create_delegation_token_request",
    "CreateDelegationTokenResponse": "create_delegation_token_response",
    "CreatePartitionsRequest": "create_partitions_request",
    "CreatePartitionsResponse": "create_partitions_response",
    "CreateTopicsRequest": "create_topics_request",
    "CreateTopicsResponse": "create_topics_response",
    "DefaultPrincipalData": "default_principal_data",
    "DeleteAclsRequest": "delete_acls_request",
    "DeleteAclsResponse": "delete_acls_response",
    "DeleteGroupsRequest": "delete_groups_request",
    "DeleteGroupsResponse": "delete_groups_response",
    "DeleteRecordsRequest": "delete_records_request",
    "DeleteRecordsResponse": "delete_records_response",
    "DeleteShareGroupOffsetsRequest": "delete_share_group_offsets_request",
    "DeleteShareGroupOffsetsResponse": "delete_share_group_offsets_response",
    "DeleteShareGroupStateRequest": "delete_share_group_state_request",
    "DeleteShareGroupStateResponse": "delete_share_group_state_response",
    "DeleteTopicsRequest": "delete_topics_request",
    "DeleteTopicsResponse": "delete_topics_response",
    "DescribeAclsRequest": "describe_acls_request",
    "DescribeAclsResponse": "describe_acls_response",
    "DescribeClientQuotasRequest": "describe_client_quotas_request",
    "DescribeClientQuotasResponse": "describe_client_quotas_response",
    "DescribeClusterRequest": "describe_cluster_request",
    "DescribeClusterResponse": "describe_cluster_response",
    "DescribeConfigsRequest": "describe_configs_request",
    "DescribeConfigsResponse": "describe_configs_response",
    "DescribeDelegationTokenRequest": "describe_delegation_token_request",
    "DescribeDelegationTokenResponse": "describe_delegation_token_response",
    "DescribeGroupsRequest": "describe_groups_request",
    "DescribeGroupsResponse": "describe_groups_response",
    "DescribeLogDirsRequest": "describe_log_dirs_request",
    "DescribeLogDirsResponse": "describe_log_dirs_response",
    "DescribeProducersRequest": "describe_producers_request",
    "DescribeProducersResponse": "describe_producers_response",
    "DescribeQuorumRequest": "describe_quorum_request",
    "DescribeQuorumResponse": "describe_quorum_response",
    "DescribeShareGroupOffsetsRequest": "describe_share_group_offsets_request",
    "DescribeShareGroupOffsetsResponse": "describe_share_group_offsets_response",
    "DescribeTopicPartitionsRequest": "describe_topic_partitions_request",
    "DescribeTopicPartitionsResponse": "describe_topic_partitions_response",
    "DescribeTransactionsRequest": "describe_transactions_request",
    "DescribeTransactionsResponse": "describe_transactions_response",
    "DescribeUserScramCredentialsRequest": "describe_user_scram_credentials_request",
    "DescribeUserScramCredentialsResponse": "describe_user_scram_credentials_response",
    "ElectLeadersRequest": "elect_leaders_request",
    "ElectLeadersResponse": "elect_leaders_response",
    "EndQuorumEpochRequest": "end_quorum_epoch_request",
    "EndQuorumEpochResponse": "end_quorum_epoch_response",
    "EndTxnMarker": "end_txn_marker",
    "EndTxnRequest": "end_txn_request",
    "EndTxnResponse": "end_txn_response",
    "EnvelopeRequest": "envelope_request",
    "EnvelopeResponse": "envelope_response",
    "ExpireDelegationTokenRequest": "expire_delegation_token_request",
    "ExpireDelegationTokenResponse": "expire_delegation_token_response",
    "FetchRequest": "fetch_request",
    "FetchResponse": "fetch_response",
    "FetchSnapshotRequest": "fetch_snapshot_request",
    "FetchSnapshotResponse": "fetch_snapshot_response",
    "FindCoordinatorRequest": "find_coordinator_request",
    "FindCoordinatorResponse": "find_coordinator_response",
    "GetTelemetrySubscriptionsRequest": "get_telemetry_subscriptions_request",
    "GetTelemetrySubscriptionsResponse": "get_telemetry_subscriptions_response",
    "HeartbeatRequest": "heartbeat_request",
    "HeartbeatResponse": "heartbeat_response",
    "IncrementalAlterConfigsRequest": "incremental_alter_configs_request",
    "IncrementalAlterConfigsResponse": "incremental_alter_configs_response",
    "InitProducerIdRequest": "init_producer_id_request",
    "InitProducerIdResponse": "init_producer_id_response",
    "InitializeShareGroupStateRequest": "initialize_share_group_state_request",
    "InitializeShareGroupStateResponse": "initialize_share_group_state_response",
    "JoinGroupRequest": "join_group_request",
    "JoinGroupResponse": "join_group_response",
    "KRaftVersionRecord": "kraft_version_record",
    "LeaderAndIsrRequest": "leader_and_isr_request",
    "LeaderAndIsrResponse": "leader_and_isr_response",
    "LeaderChangeMessage": "leader_change_message",
    "LeaveGroupRequest": "leave_group_request",
    "LeaveGroupResponse": "leave_group_response",
    "ListConfigResourcesRequest": "list_config_resources_request",
    "ListConfigResourcesResponse": "list_config_resources_response",
    "ListGroupsRequest": "list_groups_request",
    "ListGroupsResponse": "list_groups_response",
    "ListOffsetsRequest": "list_offsets_request",
    "ListOffsetsResponse": "list_offsets_response",
    "ListPartitionReassignmentsRequest": "list_partition_reassignments_request",
    "ListPartitionReassignmentsResponse": "list_partition_reassignments_response",
    "ListTransactionsRequest": "list_transactions_request",
    "ListTransactionsResponse": "list_transactions_response",
    "MetadataRequest": "metadata_request",
    "MetadataResponse": "metadata_response",
    "OffsetCommitRequest": "offset_commit_request",
    "OffsetCommitResponse": "offset_commit_response",
    "OffsetDeleteRequest": "offset_delete_request",
    "OffsetDeleteResponse": "offset_delete_response",
    "OffsetFetchRequest": "offset_fetch_request",
    "OffsetFetchResponse": "offset_fetch_response",
    "OffsetForLeaderEpochRequest": "offset_for_leader_epoch_request",
    "OffsetForLeaderEpochResponse": "offset_for_leader_epoch_response",
    "ProduceRequest": "produce_request",
    "ProduceResponse": "produce_response",
    "PushTelemetryRequest": "push_telemetry_request",
    "PushTelemetryResponse": "push_telemetry_response",
    "ReadShareGroupStateRequest": "read_share_group_state_request",
    "ReadShareGroupStateResponse": "read_share_group_state_response",
    "ReadShareGroupStateSummaryRequest": "read_share_group_state_summary_request",
    "ReadShareGroupStateSummaryResponse": "read_share_group_state_summary_response",
    "RemoveRaftVoterRequest": "remove_raft_voter_request",
    "RemoveRaftVoterResponse": "remove_raft_voter_response",
    "RenewDelegationTokenRequest": "renew_delegation_token_request",
    "RenewDelegationTokenResponse": "renew_delegation_token_response",
    "RequestHeader": "request_header",
    "ResponseHeader": "response_header",
    "SaslAuthenticateRequest": "sasl_authenticate_request",
    "SaslAuthenticateResponse": "sasl_authenticate_response",
    "SaslHandshakeRequest": "sasl_handshake_request",
    "SaslHandshakeResponse": "sasl_handshake_response",
    "ShareAcknowledgeRequest": "share_acknowledge_request",
    "ShareAcknowledgeResponse": "share_acknowledge_response",
    "ShareFetchRequest": "share_fetch_request",
    "ShareFetchResponse": "share_fetch_response",
    "ShareGroupDescribeRequest": "share_group_describe_request",
    "ShareGroupDescribeResponse": "share_group_describe_response",
    "ShareGroupHeartbeatRequest": "share_group_heartbeat_request",
    "ShareGroupHeartbeatResponse": "share_group_heartbeat_response",
    "SnapshotFooterRecord": "snapshot_footer_record",
    "SnapshotHeaderRecord": "snapshot_header_record",
    "StopReplicaRequest": "stop_replica_request",
    "StopReplicaResponse": "stop_replica_response",
    "StreamsGroupDescribeRequest": "streams_group_describe_request",
    "StreamsGroupDescribeResponse": "streams_group_describe_response",
    "StreamsGroupHeartbeatRequest": "streams_group_heartbeat_request",
    "StreamsGroupHeartbeatResponse": "streams_group_heartbeat_response",
    "SyncGroupRequest": "sync_group_request",
    "SyncGroupResponse": "sync_group_response",
    "TxnOffsetCommitRequest": "txn_offset_commit_request",
    "TxnOffsetCommitResponse": "txn_offset_commit_response",
    "UnregisterBrokerRequest": "unregister_broker_request",
    "UnregisterBrokerResponse": "unregister_broker_response",
    "UpdateFeaturesRequest": "update_features_request",
    "UpdateFeaturesResponse": "update_features_response",
    "UpdateMetadataRequest": "update_metadata_request",
    "UpdateMetadataResponse": "update_metadata_response",
    "UpdateRaftVoterRequest": "update_raft_voter_request",
    "UpdateRaftVoterResponse": "update_raft_voter_response",
    "VoteRequest": "vote_request",
    "VoteResponse": "vote_response",
    "VotersRecord": "voters_record",
    "WriteShareGroupStateRequest": "write_share_group_state_request",
    "WriteShareGroupStateResponse": "write_share_group_state_response",
    "WriteTxnMarkersRequest": "write_txn_markers_request",
    "WriteTxnMarkersResponse": "write_txn_markers_response",
}

_cache: dict[str, type[Any]] = {}


def message_class(name: str) -> type[Any]:
    """The generated class called ``name`` (e.g. ``"MetadataRequest"``), imported on first use."""
    cls = _cache.get(name)
    if cls is None:
        if name not in MESSAGES:
            raise KeyError(f"no generated message class {name!r}")
        module = importlib.import_module(f"{__name__}.{MESSAGES[name]}")
        cls = _cache[name] = getattr(module, name)
    return cls


def request_class(api_key: int) -> type[Any]:
    """The request class of an API key; ``KeyError`` for a key Kafka does not define."""
    return message_class(APIS[api_key].request)


def response_class(api_key: int) -> type[Any]:
    """The response class of an API key; ``KeyError`` for a key Kafka does not define."""
    return message_class(APIS[api_key].response)


def __getattr__(name: str) -> type[Any]:
    # PEP 562: ``messages.MetadataRequest`` imports its module on first access.
    if name in MESSAGES:
        return message_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "APIS",
    "API_KEYS",
    "MESSAGES",
    "ApiInfo",
    "ApiKey",
    "message_class",
    "request_class",
    "response_class",
]
