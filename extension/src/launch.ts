import { showErrorMessage } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';

import { ICatalog } from './api';

/** What the launch form asks for. */
export interface ILaunchOptions {
  accelerator: string;
  backend: string; // '' lets tpunb choose: gcp with a project configured, else local
  zone: string;
  spot: boolean;
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
  return parts.join(' ');
}

/**
 * Insert the launch line as a new cell below the active one in the active notebook and run it,
 * so that notebook's kernel owns the slice (the dask-labextension pattern). tpunb's magics are
 * loaded silently first, so the cell holds just the launch line.
 */
export async function launchInNotebook(tracker: INotebookTracker, code: string): Promise<boolean> {
  const panel = tracker.currentWidget;
  if (!panel) {
    await showErrorMessage('No notebook', 'Open a notebook first: the slice belongs to the notebook that launches it.');
    return false;
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
