// @ts-check
// The playground: chat with a running model or a route through the gateway, one pane or
// two side by side. Answers are shown as Markdown (lib/markdown.js) while they stream, with
// the time to the first token as soon as it comes and the speed as it goes under each;
// the same request as curl or Python.

import { api, errorFrom, itemsOf } from '../lib/api.js';
import { h, pageHead } from '../lib/dom.js';
import { renderMarkdown } from '../lib/markdown.js';
import { isAdmin } from '../lib/session.js';

/**
 * What the composer's settings say for every pane.
 * @typedef {{system: string, temperature: number, max_tokens: number, top_p: number}} Settings
 */

/** @typedef {{role: string, content: string}} Message */

/** @import { Route } from '../lib/api-types' */

/**
 * Where an answer stands, as its stream tells it: when it was sent and its first and
 * latest text came (`performance.now()` times), its text and how many pieces it came in,
 * the usage it reported and the backend's own timings (llama.cpp's; both sent last, so
 * only an answer that ended has them), the route target that answered.
 * @typedef {{
 *   sent: number,
 *   first: number | null,
 *   last: number | null,
 *   ended: number | null,
 *   text: string,
 *   deltas: number,
 *   usage: {completion_tokens?: number} | null,
 *   timings: {predicted_per_second?: number} | null,
 *   target: string | null,
 *   outcome: 'streaming' | 'done' | 'stopped' | 'failed',
 * }} AnswerState
 */

/**
 * The shortest stretch of an answer's arrival its speed is timed over: text that comes
 * faster arrives in bursts (the network and the gateway send what is ready together), so
 * a shorter stretch would time the bursts, not the model.
 */
const MIN_TIMED_MS = 250;

/**
 * The line under an answer: the time to its first token as soon as it came, its speed
 * and length as it goes, and how it ended. Lengths are in tokens: the answer's own count
 * when it reported its usage, else one token per piece of text it streamed, which is
 * said to be an estimate. The speed is the backend's own when it reported one, else
 * timed here from the first to the latest text once that is long enough to time.
 * @param {AnswerState} state
 * @param {string} asked the model the request named
 * @param {number} now
 * @returns {HTMLElement[]}
 */
function answerStats(state, asked, now) {
  /** @type {HTMLElement[]} */
  const parts = [];
  /**
   * @param {string} name
   * @param {string} text
   * @param {string} [title]
   */
  const part = (name, text, title) => parts.push(h('span', { 'data-stat': name, title: title || null }, text));
  const end = state.ended === null ? now : state.ended;
  if (state.first === null) {
    if (state.outcome === 'streaming') {
      part('waiting', 'waiting for the first token… ' + ((end - state.sent) / 1000).toFixed(1) + ' s');
    } else if (state.outcome === 'done') {
      part('tokens', 'no text in the answer');
    }
  } else {
    part('ttft', 'first token ' + Math.round(state.first - state.sent) + ' ms', 'Time from sending to the first text of the answer');
    const counted = state.usage && state.usage.completion_tokens != null ? state.usage.completion_tokens : null;
    const tokens = counted === null ? state.deltas : counted;
    const estimate = counted === null
      ? 'Estimated: one token per piece of text streamed, as the answer reported no usage' + (state.outcome === 'streaming' ? ' yet' : '') + '.'
      : undefined;
    const measured = state.timings && state.timings.predicted_per_second;
    // While it streams the stretch runs to now, so a stall shows as a falling speed;
    // once it ended, to its last text.
    const latest = state.outcome === 'streaming' ? now : /** @type {number} */ (state.last);
    if (measured) {
      part('rate', measured.toFixed(1) + ' tokens/s', 'Generation speed as the backend measured it');
    } else if (tokens > 1 && latest - state.first >= MIN_TIMED_MS) {
      // The first token's time is in the time to first token: the speed counts the rest.
      const rate = (tokens - 1) / ((latest - state.first) / 1000);
      part('rate', (counted === null ? '≈ ' : '') + rate.toFixed(1) + ' tokens/s',
        estimate || 'Timed in this browser, from the first text of the answer to its last.');
    }
    part('tokens', tokens + (tokens === 1 ? ' token' : ' tokens') + (counted === null ? ' (estimated)' : ''), estimate);
  }
  if (state.outcome === 'stopped') part('outcome', 'stopped');
  // A model that answers to its own name needs no "via".
  if (state.target && state.target !== asked) part('via', 'via ' + state.target);
  return parts;
}

/**
 * Reads an OpenAI server-sent event stream: calls `onEvent` with each `data:` line's
 * JSON until `[DONE]` or the end of the body. Aborting the request's signal ends it.
 * @param {Response} response
 * @param {(event: any) => void} onEvent
 * @returns {Promise<void>}
 */
async function readEvents(response, onEvent) {
  // The caller read the status: an answer that streams has a body.
  const reader = /** @type {ReadableStream<Uint8Array>} */ (response.body).getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffered += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, newline).trim();
      buffered = buffered.slice(newline + 1);
      if (!line.startsWith('data:')) continue;
      const data = line.slice(5).trim();
      if (data === '[DONE]') return;
      try {
        onEvent(JSON.parse(data));
      } catch (_) {
        // A line that is not JSON (a comment, a keep-alive) carries nothing to show.
      }
    }
  }
}

/**
 * The request a pane sends: the settings, the system prompt and its conversation.
 * @param {string} model
 * @param {Settings} settings
 * @param {Message[]} messages
 */
function chatRequest(model, settings, messages) {
  const all = settings.system ? [{ role: 'system', content: settings.system }].concat(messages) : messages;
  return {
    model,
    messages: all,
    temperature: settings.temperature,
    top_p: settings.top_p,
    max_tokens: settings.max_tokens,
    stream: true,
    stream_options: { include_usage: true },
  };
}

/**
 * @param {string} text
 * @returns {string}
 */
function shellQuote(text) {
  return "'" + text.replace(/'/g, "'\\''") + "'";
}

/**
 * The same request as a curl command and as Python with OpenAI's client.
 * @param {ReturnType<typeof chatRequest>} request
 * @param {'curl' | 'python'} language
 * @returns {string}
 */
function requestAsCode(request, language) {
  const base = location.origin;
  if (language === 'curl') {
    return 'curl -N ' + base + '/v1/chat/completions \\\n' +
      '  -H "Authorization: Bearer $GANTRY_API_KEY" \\\n' +
      '  -H "Content-Type: application/json" \\\n' +
      '  -d ' + shellQuote(JSON.stringify(request, null, 2));
  }
  /** @param {unknown} value */
  const py = (value) => JSON.stringify(value, null, 4)
    .replace(/\btrue\b/g, 'True').replace(/\bfalse\b/g, 'False').replace(/\bnull\b/g, 'None');
  return 'import os\nfrom openai import OpenAI\n\n' +
    'client = OpenAI(base_url="' + base + '/v1", api_key=os.environ["GANTRY_API_KEY"])\n' +
    'stream = client.chat.completions.create(\n' +
    '    model=' + JSON.stringify(request.model) + ',\n' +
    '    messages=' + py(request.messages).replace(/\n/g, '\n    ') + ',\n' +
    '    temperature=' + request.temperature + ',\n' +
    '    top_p=' + request.top_p + ',\n' +
    '    max_tokens=' + request.max_tokens + ',\n' +
    '    stream=True,\n' +
    ')\n' +
    'for chunk in stream:\n' +
    '    if chunk.choices:\n' +
    '        print(chunk.choices[0].delta.content or "", end="", flush=True)\n' +
    'print()\n';
}

/**
 * @param {ReturnType<typeof chatRequest>} request
 */
function showCode(request) {
  const code = h('pre', { class: 'code', 'data-code': '' });
  const tabs = /** @type {('curl' | 'python')[]} */ (['curl', 'python']).map((language) => h('button', {
    type: 'button',
    class: 'small',
    'data-language': language,
    onclick: () => choose(language),
  }, language === 'curl' ? 'curl' : 'Python'));
  /** @param {'curl' | 'python'} language */
  const choose = (language) => {
    code.textContent = requestAsCode(request, language);
    for (const tab of tabs) tab.classList.toggle('primary', tab.dataset.language === language);
  };
  choose('curl');
  /** @type {HTMLButtonElement} */
  const copy = h('button', {
    type: 'button',
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(code.textContent);
      } catch (_) {
        const range = document.createRange();
        range.selectNodeContents(code);
        const selection = /** @type {Selection} */ (getSelection());
        selection.removeAllRanges();
        selection.addRange(range);
        document.execCommand('copy');
      }
      copy.textContent = 'Copied';
      setTimeout(() => (copy.textContent = 'Copy'), 2000);
    },
  }, 'Copy');
  /** @type {HTMLDialogElement} */
  const dialog = h('dialog', { class: 'wide' },
    h('h2', null, 'This request as code'),
    h('p', { class: 'muted small' }, 'Set GANTRY_API_KEY to an API key (API keys screen). The console itself sends it with your session.'),
    h('div', { class: 'tabs' }, tabs),
    code,
    h('div', { class: 'form-actions' }, copy, h('button', { type: 'button', class: 'primary', onclick: () => dialog.close() }, 'Close')));
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
}

/**
 * One conversation with one model: its transcript, and a send that streams the answer
 * into it with time to first token and tokens per second under it.
 * @param {number} index
 * @param {string[]} models
 * @param {string | null} chosen
 * @param {Set<string>} routeNames
 */
function chatPane(index, models, chosen, routeNames) {
  const select = h('select', { 'aria-label': 'Model of pane ' + (index + 1), 'data-pane-model': index },
    models.map((m) => h('option', { value: m }, routeNames.has(m) ? m + ' (route)' : m)));
  if (chosen && models.includes(chosen)) select.value = chosen;
  const transcript = h('div', { class: 'transcript', 'data-transcript': index, 'aria-live': 'polite' },
    h('div', { class: 'muted small empty-chat' }, 'Send a message to start.'));
  /** @type {Message[]} the conversation so far */
  const messages = [];
  /** @type {AbortController | null} stops the answer under way */
  let controller = null;
  const pane = {
    element: h('section', { class: 'panel chat-pane', 'data-pane': index },
      h('div', { class: 'chat-pane-head' }, h('label', { class: 'field' }, h('span', null, 'Model'), select)),
      transcript),
    model: () => select.value,
    busy: () => controller !== null,
    stop: () => controller && controller.abort(),
    clear: () => {
      pane.stop();
      messages.length = 0;
      transcript.replaceChildren(h('div', { class: 'muted small empty-chat' }, 'Send a message to start.'));
    },
    /**
     * @param {Settings} settings
     * @param {string} prompt
     */
    request: (settings, prompt) => chatRequest(select.value, settings, messages.concat([{ role: 'user', content: prompt }])),
    /**
     * @param {Settings} settings
     * @param {string} prompt
     */
    send: async (settings, prompt) => {
      if (!select.value) return;
      const request = pane.request(settings, prompt);
      transcript.querySelector('.empty-chat')?.remove();
      transcript.append(h('div', { class: 'message user' }, h('div', { class: 'role' }, 'You'), h('div', { class: 'content' }, prompt)));
      const content = h('div', { class: 'content markdown', 'data-answer': '' });
      const stats = h('div', { class: 'stats muted small', 'data-stats': '' });
      const answer = h('div', { class: 'message assistant streaming' },
        h('div', { class: 'role' }, select.value), content, stats);
      transcript.append(answer);
      transcript.scrollTop = transcript.scrollHeight;
      controller = new AbortController();
      /** @type {AnswerState} */
      const state = { sent: performance.now(), first: null, last: null, ended: null, text: '', deltas: 0, usage: null, timings: null, target: null, outcome: 'streaming' };
      // Redrawn once a frame at most, however fast the chunks come: the whole answer is
      // read as Markdown again, which an unclosed fence or emphasis needs anyway. A timer
      // keeps the wait and the rate current between chunks.
      let frame = 0;
      let shown = '';
      const redraw = () => {
        frame = 0;
        const following = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 48;
        if (state.text !== shown) {
          shown = state.text;
          content.replaceChildren(...renderMarkdown(shown));
        }
        stats.replaceChildren(...answerStats(state, request.model, performance.now()));
        if (following) transcript.scrollTop = transcript.scrollHeight;
      };
      const schedule = () => {
        if (!frame) frame = requestAnimationFrame(redraw);
      };
      const ticking = setInterval(schedule, 500);
      redraw();
      try {
        const response = await fetch('/v1/chat/completions', {
          method: 'POST',
          credentials: 'same-origin',
          headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
          body: JSON.stringify(request),
          signal: controller.signal,
        });
        if (!response.ok) throw await errorFrom(response);
        state.target = response.headers.get('x-gantry-target');
        await readEvents(response, (event) => {
          if (event.usage) state.usage = event.usage;
          if (event.timings) state.timings = event.timings;
          const delta = event.choices && event.choices[0] && event.choices[0].delta;
          const text = delta && (delta.content || '');
          if (!text) return;
          state.last = performance.now();
          if (state.first === null) state.first = state.last;
          state.deltas += 1;
          state.text += text;
          schedule();
        });
        state.outcome = 'done';
      } catch (e) {
        if (e.name === 'AbortError') {
          state.outcome = 'stopped';
        } else {
          state.outcome = 'failed';
          answer.append(h('div', { class: 'alert', role: 'alert' }, e.message));
        }
      } finally {
        controller = null;
        clearInterval(ticking);
        cancelAnimationFrame(frame);
      }
      state.ended = performance.now();
      answer.classList.remove('streaming');
      answer.dataset.outcome = state.outcome;
      redraw();
      if (state.text) {
        messages.push({ role: 'user', content: prompt }, { role: 'assistant', content: state.text });
      }
    },
  };
  return pane;
}

/**
 * @param {HTMLElement} main
 * @param {string[]} parts
 * @param {URLSearchParams} params
 */
export function renderPlayground(main, parts, params) {
  const body = h('div', null, h('div', { class: 'panel empty' }, 'Loading the running models…'));
  main.append(pageHead('Playground'), body);
  /** @type {ReturnType<typeof chatPane>[]} */
  let panes = [];
  let closed = false;
  (async () => {
    /** @type {string[]} */
    let models;
    // The gateway lists routes and models alike; admins may read which are routes.
    let routeNames = new Set();
    try {
      /** @type {[{data: {id: string}[]}, Route[]]} */
      const [list, routes] = await Promise.all([
        api('GET', '/v1/models'),
        isAdmin() ? api('GET', '/api/v1/model-routes').then(itemsOf).catch(() => []) : Promise.resolve([]),
      ]);
      models = list.data.map((m) => m.id).sort();
      routeNames = new Set(routes.map((r) => r.name));
    } catch (e) {
      body.replaceChildren(h('div', { class: 'panel' }, h('div', { class: 'alert' }, e.message)));
      return;
    }
    if (closed) return;
    if (!models.length) {
      body.replaceChildren(h('div', { class: 'panel empty' },
        'No model has a running instance and there are no routes yet. Deploy a model on the ', h('a', { href: '#/models' }, 'Models'), ' screen.'));
      return;
    }
    const system = h('textarea', { rows: 2, placeholder: 'You are a helpful assistant.', 'aria-label': 'System prompt' });
    const temperature = h('input', { type: 'number', min: 0, max: 2, step: 0.1, value: 0.7, 'aria-label': 'Temperature' });
    const maxTokens = h('input', { type: 'number', min: 1, max: 32768, step: 1, value: 256, 'aria-label': 'Max tokens' });
    const topP = h('input', { type: 'number', min: 0, max: 1, step: 0.05, value: 1, 'aria-label': 'Top p' });
    const settings = () => ({
      system: system.value.trim(),
      temperature: Number(temperature.value),
      max_tokens: Math.round(Number(maxTokens.value)),
      top_p: Number(topP.value),
    });
    const prompt = h('textarea', { rows: 3, placeholder: 'Ask something… (Ctrl+Enter sends)', 'aria-label': 'Message' });
    const send = h('button', { class: 'primary', type: 'submit' }, 'Send');
    const stop = h('button', { type: 'button', disabled: true, onclick: () => panes.forEach((p) => p.stop()) }, 'Stop');
    const clear = h('button', { type: 'button', onclick: () => panes.forEach((p) => p.clear()) }, 'Clear');
    const code = h('button', {
      type: 'button',
      onclick: () => showCode(panes[0].request(settings(), prompt.value || 'Hello!')),
    }, 'View as code');
    const compare = h('input', { type: 'checkbox', 'aria-label': 'Compare two models' });
    const grid = h('div', { class: 'chat-panes' });
    const error = h('div', { class: 'alert', role: 'alert' });
    // The first pane keeps its conversation when the second comes or goes.
    const layout = () => {
      if (!panes.length) panes = [chatPane(0, models, params.get('model'), routeNames)];
      if (panes[1]) panes[1].stop();
      const first = panes[0].model();
      panes = compare.checked
        ? [panes[0], chatPane(1, models, models.find((m) => m !== first) || first, routeNames)]
        : [panes[0]];
      grid.classList.toggle('two', compare.checked);
      grid.replaceChildren(...panes.map((p) => p.element));
    };
    compare.addEventListener('change', layout);
    const form = h('form', {
      class: 'panel composer',
      onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = '';
        const text = prompt.value.trim();
        if (!text) return;
        const chosen = settings();
        if (!(chosen.temperature >= 0 && chosen.temperature <= 2)) { error.textContent = 'Temperature must be between 0 and 2.'; return; }
        if (!(chosen.top_p > 0 && chosen.top_p <= 1)) { error.textContent = 'Top p must be above 0 and at most 1.'; return; }
        if (!(chosen.max_tokens >= 1)) { error.textContent = 'Max tokens must be at least 1.'; return; }
        prompt.value = '';
        send.disabled = true;
        stop.disabled = false;
        try {
          await Promise.all(panes.map((p) => p.send(chosen, text)));
        } finally {
          send.disabled = false;
          stop.disabled = true;
          prompt.focus();
        }
      },
    },
    prompt,
    error,
    h('div', { class: 'form-actions' }, code, clear, stop, send));
    prompt.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && (event.ctrlKey || event.metaKey)) form.requestSubmit();
    });
    body.replaceChildren(
      h('div', { class: 'panel' }, h('div', { class: 'form-grid' },
        h('label', { class: 'field wide' }, h('span', null, 'System prompt'), system),
        h('label', { class: 'field' }, h('span', null, 'Temperature'), temperature),
        h('label', { class: 'field' }, h('span', null, 'Max tokens'), maxTokens),
        h('label', { class: 'field' }, h('span', null, 'Top p'), topP),
        h('label', { class: 'field check' }, compare, h('span', null, 'Compare two models side by side')))),
      grid,
      form);
    layout();
    prompt.focus();
  })();
  return () => {
    closed = true;
    panes.forEach((p) => p.stop());
  };
}
