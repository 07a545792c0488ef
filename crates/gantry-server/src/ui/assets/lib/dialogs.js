// @ts-check
// Dialogs and actions: a modal form whose errors stay in it, a confirmation before a
// delete, and act(), which runs a button's action and says how it went in a toast.

import { h, toast } from './dom.js';

/** @import { Child } from './dom.js' */

/**
 * @typedef {object} DialogOptions
 * @property {() => Promise<void> | void} onSubmit throws to keep the dialog open with its message
 * @property {string} [submitLabel] the submit button's text; `Save` by default
 * @property {boolean} [danger] a red submit button
 */

/**
 * A modal form. `onSubmit` may throw; its message is shown in the dialog, which
 * stays open so the input can be fixed.
 * @param {string} title
 * @param {Child} body
 * @param {DialogOptions} options
 * @returns {HTMLDialogElement}
 */
export function openDialog(title, body, options) {
  const error = h('div', { class: 'alert', role: 'alert' });
  const submit = h('button', { class: options.danger ? 'danger solid' : 'primary', type: 'submit' }, options.submitLabel || 'Save');
  const dialog = h('dialog', null);
  const close = () => {
    dialog.close();
    dialog.remove();
  };
  const form = h('form', {
    onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = '';
      submit.disabled = true;
      try {
        await options.onSubmit();
        close();
      } catch (e) {
        error.textContent = e.message;
        submit.disabled = false;
      }
    },
  },
  h('h2', null, title),
  body,
  error,
  h('div', { class: 'form-actions' }, h('button', { type: 'button', onclick: close }, 'Cancel'), submit));
  dialog.append(form);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  const first = /** @type {HTMLElement | null} */ (form.querySelector('input, select, textarea'));
  (first || submit).focus();
  return dialog;
}

/**
 * Asks before something that cannot be undone; `action` runs on the red button.
 * @param {string} title
 * @param {string} message
 * @param {string} label the button that does it
 * @param {() => Promise<void>} action
 */
export function confirmDialog(title, message, label, action) {
  openDialog(title, h('p', null, message), { submitLabel: label, danger: true, onSubmit: action });
}

/**
 * Runs an action from a button and reports its outcome as a toast.
 * @param {HTMLButtonElement | HTMLSelectElement | null} button disabled while the action runs
 * @param {() => Promise<unknown>} action
 * @param {string} [success] the toast when it worked
 */
export async function act(button, action, success) {
  if (button) button.disabled = true;
  try {
    await action();
    if (success) toast(success);
  } catch (e) {
    toast(e.message, 'error');
  } finally {
    if (button) button.disabled = false;
  }
}
