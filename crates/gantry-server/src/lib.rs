//! The server: management API, auth, controllers, gateway, web UI.
