//! The one classification of Kafka errors into a [`Verdict`].
//!
//! Permanent: what another attempt cannot fix — the tenant is not
//! authorized, the topic does not exist (and the broker does not create
//! it), the record is too large or invalid, the settings are invalid.
//! Everything else — brokers down or unreachable, timeouts, leader
//! changes, a full producer queue, a producer that hit a fatal error — is
//! retried through the engine's normal retry path.

use belfry_core::Verdict;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The verdict of an attempt that failed with `code`.
pub fn classify_code(code: RDKafkaErrorCode) -> Verdict {
    use RDKafkaErrorCode as C;
    match code {
        // The topic does not exist (and auto-creation is off).
        C::UnknownTopic | C::UnknownTopicOrPartition | C::UnknownPartition | C::InvalidTopic
        // Too large or not acceptable as a record.
        | C::MessageSizeTooLarge
        | C::MessageBatchTooLarge
        | C::InvalidMessageSize
        | C::InvalidRecord
        | C::InvalidMessage
        | C::UnsupportedForMessageFormat
        | C::UnsupportedCompressionType
        | C::PolicyViolation
        // Not allowed.
        | C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::SaslAuthenticationFailed
        | C::Authentication
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        // Settings the broker refuses.
        | C::InvalidConfig
        | C::InvalidRequiredAcks
        | C::InvalidArgument => Verdict::Permanent,
        _ => Verdict::Retry,
    }
}

/// The verdict of an attempt that failed with `error`.
pub fn classify(error: &KafkaError) -> Verdict {
    match error {
        // Settings librdkafka refused when the producer was built.
        KafkaError::ClientConfig(..) | KafkaError::ClientCreation(_) => Verdict::Permanent,
        // The producer went away (closed while the record was queued).
        KafkaError::Canceled => Verdict::Retry,
        other => other
            .rdkafka_error_code()
            .map_or(Verdict::Retry, classify_code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        use RDKafkaErrorCode as C;
        for code in [
            C::MessageTimedOut,
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::NotLeaderForPartition,
            C::LeaderNotAvailable,
            C::RequestTimedOut,
            C::QueueFull,
            C::NotEnoughReplicas,
            C::Fatal,
        ] {
            assert_eq!(classify_code(code), Verdict::Retry, "{code:?}");
        }
        for code in [
            C::UnknownTopic,
            C::UnknownTopicOrPartition,
            C::MessageSizeTooLarge,
            C::TopicAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::InvalidConfig,
        ] {
            assert_eq!(classify_code(code), Verdict::Permanent, "{code:?}");
        }
        assert_eq!(
            classify(&KafkaError::MessageProduction(C::QueueFull)),
            Verdict::Retry
        );
        assert_eq!(classify(&KafkaError::Canceled), Verdict::Retry);
    }
}
