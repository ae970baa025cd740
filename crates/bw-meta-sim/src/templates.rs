//! Meta's template statuses and categories as the reference names them (§4.5), in a leaf module: the config,
//! the account state and the scenario events each check them.

/// What a template status means for sends: None = sendable, Some(code) = refused with it.
pub fn template_status_effect(status: &str) -> Result<Option<i64>, String> {
    Ok(match status.to_ascii_uppercase().as_str() {
        "APPROVED" | "REINSTATED" | "UNARCHIVED" | "FLAGGED" | "LOCKED" => None,
        "PAUSED" => Some(132_015),
        "DISABLED" => Some(132_016),
        "REJECTED" | "ARCHIVED" | "DELETED" | "PENDING_DELETION" | "PENDING" | "IN_APPEAL" | "LIMIT_EXCEEDED" => {
            Some(132_001)
        }
        other => {
            return Err(format!(
                "template status `{other}` is not one of APPROVED, PENDING, REJECTED, PAUSED, DISABLED, FLAGGED, \
                 REINSTATED, ARCHIVED, UNARCHIVED, DELETED, PENDING_DELETION, LOCKED, IN_APPEAL, LIMIT_EXCEEDED"
            ));
        }
    })
}

/// A template category the reference names.
pub fn check_category(category: &str) -> Result<(), String> {
    match category.to_ascii_uppercase().as_str() {
        "MARKETING" | "UTILITY" | "AUTHENTICATION" => Ok(()),
        other => Err(format!("category `{other}` is not one of MARKETING, UTILITY, AUTHENTICATION")),
    }
}
