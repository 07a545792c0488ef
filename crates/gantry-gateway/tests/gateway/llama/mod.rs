//! The gateway in front of a real llama.cpp `llama-server` serving the tiny model, so
//! every byte of the serving path is real: proxying and usage, streaming, balancing and
//! ejection, the HTTP/1.1 front on raw connections, and the official OpenAI client.

mod balancing;
mod http1;
mod openai_client;
mod streaming;
mod usage;
