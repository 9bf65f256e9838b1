import { ILabShell } from '@jupyterlab/application';
import { showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import { ICatalog } from './api';

/** What the launch form asks for. */
export interface ILaunchOptions {
  accelerator: string;
  backend: string; // '' lets tpunb choose: gcp with a project configured, else local
  zone: string;
  spot: boolean;
  /** Slices joined in one JAX job; 1 is a single slice. */
  slices: number;
}

/** The form's accelerator field, which the browser no longer checks (the form validates itself). */
export function parseAccelerator(text: string): string {
  const value = text.trim();
  if (!value) {
    throw new Error('accelerator: type one, e.g. v4-16 (the list offers every name)');
  }
  return value;
}

/**
 * The form's slices field as a count. Anything but a whole number >= 1 throws an Error whose
 * message is one line saying what to type, as %tpu_launch --slices would say in the notebook.
 */
export function parseSlices(text: string): number {
  const value = text.trim();
  if (!/^[0-9]+$/.test(value) || Number(value) < 1) {
    const got = value ? `'${value}'` : 'an empty field';
    throw new Error(`slices takes a whole number >= 1 (1: one slice, 2 or more: a multislice), not ${got}`);
  }
  return Number(value);
}

/** The magic the form runs: the same line a user would type, so the notebook shows what happened. */
export function launchCommand(options: ILaunchOptions): string {
  const parts = ['%tpu_launch', options.accelerator.trim()];
  if (options.backend) {
    parts.push('--backend', options.backend);
  }
  if (options.zone.trim()) {
    parts.push('--zone', options.zone.trim());
  }
  if (options.spot) {
    parts.push('--spot');
  }
  if (options.slices > 1) {
    parts.push('--slices', String(options.slices)); // one slice stays the plain line users know
  }
  return parts.join(' ');
}

/**
 * The notebook a launch belongs in: the one last focused if it is on screen; else the one the
 * main area shows (a tab restored with the page can be last focused yet hidden behind it); else
 * any notebook on screen (a split view); else the one last focused, which is then brought forward.
 */
export function targetNotebook(tracker: INotebookTracker, shell: ILabShell): NotebookPanel | null {
  const focused = tracker.currentWidget;
  if (focused?.isVisible) {
    return focused;
  }
  const shown = shell.currentWidget;
  if (shown instanceof NotebookPanel && tracker.has(shown) && shown.isVisible) {
    return shown;
  }
  return tracker.find(panel => panel.isVisible) ?? focused;
}

/**
 * Insert the launch line as a new cell below the active one in the notebook the user sees (see
 * targetNotebook) and run it, so that notebook's kernel owns the slice (the dask-labextension
 * pattern). tpunb's magics are loaded silently first, so the cell holds just the launch line.
 */
export async function launchInNotebook(tracker: INotebookTracker, shell: ILabShell, code: string): Promise<boolean> {
  const panel = targetNotebook(tracker, shell);
  if (!panel) {
    await showErrorMessage('No notebook', 'Open a notebook first: the slice belongs to the notebook that launches it.');
    return false;
  }
  if (!panel.isVisible) {
    shell.activateById(panel.id); // the launch and its progress are shown, not run in a hidden tab
  }
  await panel.sessionContext.ready;
  const kernel = panel.sessionContext.session?.kernel;
  if (!kernel) {
    await showErrorMessage('No kernel', 'Start a kernel for this notebook (Kernel menu), then launch again.');
    return false;
  }
  await kernel.requestExecute({
    code: 'get_ipython().extension_manager.load_extension("tpunb")',
    silent: true,
    store_history: false
  }).done;
  const notebook = panel.content;
  const active = notebook.activeCell;
  if (!active || active.model.type !== 'code' || active.model.sharedModel.getSource().trim()) {
    NotebookActions.insertBelow(notebook); // keep the user's code: the launch line gets its own cell
  }
  notebook.activeCell?.model.sharedModel.setSource(code);
  await NotebookActions.run(notebook, panel.sessionContext);
  return true;
}

/** Fill a datalist element with options, for the browser's own completion. */
export function fillDatalist(list: HTMLDataListElement, values: string[]): void {
  list.replaceChildren(
    ...values.map(value => {
      const option = document.createElement('option');
      option.value = value;
      return option;
    })
  );
}

export type { ICatalog };
