//! `gantry chat MODEL [PROMPT]`: one question, or a conversation read line by line from
//! standard input (each answer joins the conversation), with every answer printed as the
//! gateway streams it.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Context;
use clap::Args;
use gantry_client::gateway::{ChatMessage, ChatRequest};
use gantry_client::Client;

use super::{connect, explain, Connection};

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    connection: Connection,
    /// The model's name.
    model: String,
    /// What to ask; without it, each line of standard input is a turn of one conversation.
    prompt: Option<String>,
    /// A system message that opens the conversation.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// The most tokens of each answer (the model's default otherwise).
    #[arg(long, value_name = "N")]
    max_tokens: Option<u32>,
}

pub async fn run(args: ChatArgs) -> anyhow::Result<()> {
    let client = connect(&args.connection)?;
    let mut conversation: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|text| ChatMessage {
            role: "system".to_owned(),
            content: text.clone(),
        })
        .collect();
    let chat = Chat {
        client: &client,
        model: &args.model,
        max_tokens: args.max_tokens,
    };
    if let Some(prompt) = args.prompt {
        conversation.push(ChatMessage::user(prompt));
        chat.answer(&conversation).await?;
        return Ok(());
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("Chatting with {}; end with Ctrl-D.", args.model);
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else {
            break;
        };
        let line = line.context("read standard input")?;
        if line.trim().is_empty() {
            continue;
        }
        conversation.push(ChatMessage::user(line));
        match chat.answer(&conversation).await {
            Ok(answer) => conversation.push(ChatMessage::assistant(answer)),
            // At a terminal the conversation goes on without the failed turn.
            Err(e) if interactive => {
                eprintln!("error: {e:#}");
                conversation.pop();
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

struct Chat<'a> {
    client: &'a Client,
    model: &'a str,
    max_tokens: Option<u32>,
}

impl Chat<'_> {
    /// Prints the model's answer to the conversation as it streams, and returns it.
    async fn answer(&self, conversation: &[ChatMessage]) -> anyhow::Result<String> {
        let mut request = ChatRequest::new(self.model, conversation.to_vec());
        request.max_tokens = self.max_tokens;
        let mut stream = self
            .client
            .chat_stream(&request)
            .await
            .map_err(explain)
            .with_context(|| format!("chat with {}", self.model))?;
        let mut answer = String::new();
        let mut stdout = std::io::stdout();
        while let Some(piece) = stream.next().await {
            let piece = piece.map_err(explain)?;
            stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush())
                .context("write the answer")?;
            answer.push_str(&piece);
        }
        writeln!(stdout).context("write the answer")?;
        Ok(answer)
    }
}
