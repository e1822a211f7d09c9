"""``v2proxy inject``: a mutating admission webhook that adds v2proxy to annotated pods."""
