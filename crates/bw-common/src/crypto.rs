//! The process-wide rustls crypto provider. A leaf: telemetry (OTLP over HTTPS), the service start-up and
//! every HTTPS client install it before their first TLS connection.

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
